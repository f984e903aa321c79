"""RL: advantage estimators, losses, the update step and the trainer loop."""
