"""agent-stores-dictdb: an example backend written against docs/plugins.md and docs/kv.md.

Its storage is an in-process dict (``dictdb://NAME``, shared by the clients of one process)
and it offers native ports for all three stores, each operation one atomic request to the
"server": :mod:`agent_stores_dictdb.sessions`, :mod:`agent_stores_dictdb.memory`,
:mod:`agent_stores_dictdb.journal`.
"""
