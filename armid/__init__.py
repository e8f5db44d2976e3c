"""The `armid` console command."""
