"""Process lifecycle: signals and the systemd notify protocol."""
