"""Every wire format the arm's firmware speaks (CiA 402 objects and PDO maps, serial frames, gateway registers, the state stream), defined once, and the helpers every layer of armid shares."""
