"""Published modelling code the tests run as their reference, vendored (each file says from where)."""
