"""Table lineage (the topology around a table) and data lineage of one snapshot."""
