"""Choosing what to label next (`vit select`).

    choose.py   the choice on features: typical and diverse (a cold start), uncertain and diverse (later rounds)
    pool.py     the pool of image files: its features, its near-duplicates, the labels file and grid written
"""
