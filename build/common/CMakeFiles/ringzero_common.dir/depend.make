# Empty dependencies file for ringzero_common.
# This may be replaced when dependencies are built.
