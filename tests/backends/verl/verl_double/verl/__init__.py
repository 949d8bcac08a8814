"""TEST DOUBLE of the verl package (see ../README.md). Not verl."""
