"""The Wyoming protocol (Home Assistant's voice pipeline) on its own TCP port."""
