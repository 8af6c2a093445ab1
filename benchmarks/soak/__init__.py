"""``tenure bench soak``: the scaled-out stack under steady agent traffic and a fault schedule."""
