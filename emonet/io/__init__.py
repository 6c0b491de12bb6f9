"""Files in and out: images (:mod:`.images`), video decoding and writing (:mod:`.video`, in a child
process: :mod:`.decode_worker`), and the one atomic writer every output goes through (:mod:`.atomic`)."""
