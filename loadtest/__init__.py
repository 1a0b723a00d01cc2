"""`attnserve loadtest`: closed- and open-loop load against a server or a fleet, with a latency report."""
