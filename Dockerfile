# One image for every servelens role; the command picks the role.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY servelens servelens
COPY collector collector
COPY analytics analytics
COPY dashboard dashboard
COPY migrations migrations
RUN pip install --no-cache-dir -e .
EXPOSE 4317 4318 8050
ENTRYPOINT ["servelens"]
CMD ["up", "--host", "0.0.0.0"]
