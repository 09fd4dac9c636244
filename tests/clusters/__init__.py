"""Real clusters and object stores for the tests, started from what pip and npm install:
a standalone Spark cluster and a Spark Connect server from the pyspark wheel
(``clusters.spark``), moto's S3 server and Azurite (``clusters.objectstores``), the pytest
fixtures that start them (``clusters.fixtures``), and the work dispatched to executors the
same way on classic and Connect sessions (``clusters.jobs``)."""
