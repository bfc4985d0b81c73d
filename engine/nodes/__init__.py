"""Several nodes: `carl node --join URL` samples another machine and follows its consoles, publishing over
NATS JetStream (publisher.py); the engine that holds the store reads that stream and stores it per node,
marking lost a node that went quiet (nodes_job.py, consumer.py, writer.py). What travels, and how it is
checked, is wire.py. docs/guide/nodes.md is the user's page."""

from .node_settings import NodesSettings, load_nodes_settings
from .nodes_job import NodesJob
from .wire import STREAM, Rejected, default_node_name, node_name_problem, parse

__all__ = [
    "STREAM",
    "NodesJob",
    "NodesSettings",
    "Rejected",
    "default_node_name",
    "load_nodes_settings",
    "node_name_problem",
    "parse",
]
