"""The `ladder` command line (`cli`) and the commands that are more than a run or a sweep:
`check` (the contract checks any workload must pass) and `scaffold` (`ladder new`)."""
