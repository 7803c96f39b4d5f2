"""Jobs, tables and the ETL topology (a DAG)."""
