"""The engines that schedule storelib's tasks (in-process, a process pool, Spark) and the task maps of the
audit and the rebuild over them."""
