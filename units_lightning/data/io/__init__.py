"""File and archive I/O: safe zips, listing and decoding image files, the tensor cache, restricted unpickling."""
