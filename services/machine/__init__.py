"""Process lifecycle on one machine (as EMQX's emqx_machine): the backends
`weir up` starts itself, the supervisor of several nodes, pid files, drain,
the Spark child."""
