# Empty compiler generated dependencies file for ch01_training_loop.
# This may be replaced when dependencies are built.
