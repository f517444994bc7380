"""Local stand-ins for cluster services: embedded Redis (``embedded_redis``), S3 and MLflow helpers.

Each helper starts a real server on loopback so one machine runs the whole platform.
"""
