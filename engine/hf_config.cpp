// placeholder; being written
