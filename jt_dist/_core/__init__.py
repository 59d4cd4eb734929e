"""The primitive, and a call's binding into the static spec it carries."""
