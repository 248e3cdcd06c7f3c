file(REMOVE_RECURSE
  "libringzero_common.a"
)
