"""ladder's workloads: one research method per subpackage, each exporting Config, train and smoke."""
