"""Choosing what to label next (`vit select`): the choice on features (`choose`), and the pool of image files it
reads, with its features, near-duplicates and outputs (`pool`)."""
