"""The exact-velocity model: the Gaussian mixture under the flow-matching (rectified-flow) path."""
