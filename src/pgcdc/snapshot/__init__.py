"""What an initial copy reads: tables cut into block ranges, each read with COPY into typed
Arrow (the copy itself, with Spark and the targets, is the pipeline's: `pgcdc.pipeline`)."""
