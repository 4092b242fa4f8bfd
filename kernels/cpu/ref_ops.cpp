// placeholder; replaced by the CPU ops work
