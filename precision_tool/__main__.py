from precision_tool.cli.main import entry_point

entry_point()
