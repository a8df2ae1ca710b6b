"""Which tests a run collects and keeps: ``--fla-quick``'s subset, nested projects refused."""
