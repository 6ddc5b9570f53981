"""What runs inside a Serve replica: the replica base class, its HTTP front, admission, metrics."""
