"""What keeps a trace from changing the world around it.

The patch window (every replacement of a torch or Python function during a trace,
restored on exit, error, interrupt, and invisible to other threads), the world state
checked before and after, torch.fx's own isolation, user module classes, deferred
Ctrl-C, and the frames that tell torch's code from the user's.
"""
