# One image for every servelens role; the command picks the role.
# The wheel is built in its own stage and installed as a user would (`pip install`, not -e).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src src
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim
COPY --from=build /dist /dist
RUN pip install --no-cache-dir /dist/*.whl && rm -rf /dist
# Compile the capacity replay's loop into the image (numba caches it next to the module), so
# a container's first replay does not wait ~10 s for it.
RUN python -c "from servelens.analytics.plan.simulate import Server, simulate; \
simulate([0.0, 0.5], [10, 20], [5, 5], Server(0.01, 1e-5, 1e-4))"
WORKDIR /var/lib/servelens
EXPOSE 4317 4318 8050
ENTRYPOINT ["servelens"]
CMD ["up", "--host", "0.0.0.0"]
