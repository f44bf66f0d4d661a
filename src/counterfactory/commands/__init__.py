"""CLI subcommands. Every module in this package defines ``register(subparsers)``;
``counterfactory.cli`` imports them all, so adding a stage never edits a shared file."""
