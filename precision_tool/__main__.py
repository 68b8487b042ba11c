from precision_tool.cli.entry import entry_point

entry_point()
