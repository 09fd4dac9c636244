"""What an initial copy reads: tables cut into block ranges, each read with COPY into typed
Arrow (the copy itself, with Spark and the targets, is `pgcdc.spark.initial_copy`)."""
