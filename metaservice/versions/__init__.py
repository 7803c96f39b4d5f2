"""Consistent versions of table sets, and leases that pin them."""
