"""Audio containers and sample formats."""
