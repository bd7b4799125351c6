"""The ground floor: configuration, the store client, migrations, retention and serving. It imports nothing above it."""
