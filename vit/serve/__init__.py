"""`vit serve`: core.py checks, decodes, batches and predicts (no HTTP); app.py is the FastAPI front end;
schema.py states the answers' and requests' shapes (the OpenAPI schema); page.html is the page served at /.
FastAPI, uvicorn and friends come with ``pip install 'vit[serve]'``."""
