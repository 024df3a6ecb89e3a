"""`deviceplugin inspect` / `kubectl gpushare`: GPU allocation per node and per GPU, read from what
the device plugin and the scheduler publish on nodes and pods (via the shared-fit library).

Layout: `source` (kubeconfig, API reads) -> `collect` (one node's report through `deviceplugin.fit`,
`strategy` detection) -> `report` (cluster) -> `text` / `jsondoc` (printers) -> `command` (CLI).
"""

from deviceplugin.inspect.command import add_parser, kubectl_main, main

__all__ = ["add_parser", "kubectl_main", "main"]
