"""THE recovery walk (normal and abnormal, one walk parameterised by where it starts and what it checks) and
the resynchroniser past a corrupt region; dispatch, the rebuild and the start-up replay build on them."""
