"""What keeps a trace from changing the world around it.

The patch window (every replacement of a torch or Python function during a trace,
restored on exit, error, interrupt, and invisible to other threads) and the patching
helper that installs replacements in it (with the type slots a special method leaves
behind), the world state checked before and after, the user's modules restored after a
trace, torch.fx's own isolation, user module classes, deferred Ctrl-C, and the frames
that tell torch's code from the user's. Nothing here knows proxies.
"""
