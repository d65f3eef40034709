"""Plan to Spark builder, the query host, migrations and the command line."""
