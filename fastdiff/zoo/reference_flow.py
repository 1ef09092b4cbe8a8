"""``digits-flow``: a text-conditional SD3-shaped digits reference trained with the rectified-flow loss."""
