"""Docker Swarm test harness (see cluster.py)."""
