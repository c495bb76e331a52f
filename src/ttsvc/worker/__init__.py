"""Worker process: engines loaded once, one scheduler whose compute threads step many streams."""
