"""Capacity planning (issue 13): what-ifs on replicas and traffic for a deployment."""
