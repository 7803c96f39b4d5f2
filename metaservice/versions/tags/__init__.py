"""Tags: a consistent version published under a name, as an Iceberg tag in every table of
the set, so any Iceberg engine reads it by name and expiry keeps it."""
