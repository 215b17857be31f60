"""The Kafka front end: the listener, the dispatch table, one handler module per API family."""
