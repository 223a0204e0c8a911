"""agent-stores-filedb: an example third-party backend on a folder of files (docs/plugins.md).

Nothing is imported here: the plugin module is loaded through the ``agent_stores`` entry
point, and the store only when a ``filedb://`` URL is opened.
"""
