"""The tracked request pipeline every proxied route runs through, and the passthrough."""
