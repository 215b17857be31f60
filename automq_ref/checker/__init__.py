"""Client-history checking: histories of Kafka operations and the checkers that judge them."""
