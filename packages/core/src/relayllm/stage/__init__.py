"""What runs in Ray Data's workers: the stage that calls a deployment, call grouping, images."""
