"""One shape per tracked API (chat, completions, messages, responses): only what differs."""
