"""How late each table is, and which job on its upstream path is to blame."""
